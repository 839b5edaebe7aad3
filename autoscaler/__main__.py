from autoscaler.cli import main

main()
