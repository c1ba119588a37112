"""What crosses process and host boundaries: state paths, key files, the local socket, NATS roles.

Below the shell folders (controller, agents, projections, cli): each of them may import it, it
imports none of them. Every module here is light (the hot commands import some of them).
"""
