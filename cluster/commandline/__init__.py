"""The `raftcron` command (DESIGN.md §6): `main` parses the argument tree and dispatches;
the other modules own one group of subcommands each (`opscli` and `opsargs` the operator's,
`flowcli` queues and flow control, `membercli` membership, `notifycli` notifications,
`settingscli` replicated settings, `exportcli` exports) and `cliparts` and `opsformat` what
they share (arguments, printing). The only room that may reach the tools in cluster/dev and
chaos/, for `raftcron demo|bench|chaos`.
"""
