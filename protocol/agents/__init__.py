"""Event-driven agents, one per role (`vtrain watch --role trainer|auditor|referee`).

An agent reads the chain, acts through its role (protocol.roles) and keeps its games and signed
transactions in a JSON state file written before anything is sent, so it can be killed and
restarted at any point without losing a game or sending a transaction twice.
"""
