"""`python -m agentx.cli`: the command line (the simulator's child process starts this way)."""

from agentx.cli import main

main()
