"""What a run leaves for people: the output folder, the model folder and its card, the run's log, the Hub."""
