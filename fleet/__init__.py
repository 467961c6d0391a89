"""Several models behind one server: the models file, residency policy, the hosts and their states."""
