"""Tests that need a real cgroup v2 kernel (marked ``vm``): the tox env 'vm' boots one under qemu and runs them
there; everywhere else they skip with the reason."""
