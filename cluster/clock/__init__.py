"""The cluster's time: `clocks` (the members' wall clocks and the majority's bound),
`clockpoll` (reading them), `ticker` (the leader's Ticks, the only command that moves the
state's time, and the stamps of claims).
"""
