"""The replicated log and what sits on it: `replica` (the state machine PySyncObj applies,
the one seam to the core's state), `proposer` (from asyncio to the log and back, group
commit), `waiters` (claims woken by applied entries), `memberdriver` (the leader's side of a
membership change), and the reviewed patches and guards of PySyncObj (`raftpatch`,
`raftguard`, `prevote`, `leaderloss`).
"""
