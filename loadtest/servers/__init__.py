"""Private coordination servers on their own ports, started and stopped by pid.

For the backend tests (tests/locks/backends) and the fault-injection load tests (`manage.py
loadtest --fault ...`): a real redis-server, Sentinel set, Cluster, Redlock masters or
ZooKeeper that a test may SIGKILL, SIGSTOP or restart, never the shared ones on the standard
ports. One module per kind; `base` has what they share.
"""
