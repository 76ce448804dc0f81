"""The kill campaign: every command killed at random moments and at each exact write, then resumed or rerun,
and compared with a straight run (`python -m tests.kill_campaign`; __main__.py explains the design)."""
