"""The rehearsal lab: test hosts on this machine that the deployment really reaches over SSH and Docker.

Its own package beside the program (the program never imports it): `python -m lab up|down|…`,
`make lab` / `make lab-down`. See lab/README.md.
"""
