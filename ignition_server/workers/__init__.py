"""Serving worker processes (`serve --workers N`, DESIGN §5).

The owner process keeps the sources, the reconciler, renders, rotation and write-back; N
worker processes listen on the same port (SO_REUSEPORT) and only serve. The owner publishes
every token-index change to every worker over a socketpair; a worker that would refuse a
request asks the owner first, so a worker's moment of lag never turns a node away.
`pool` is the owner's side, `worker` the worker's, `channel` the wire between them and
`messages` what may travel on it.
"""
