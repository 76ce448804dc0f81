"""The run plans itself: which model, vocabulary and schedule to train on this text, in this time, on this
machine (issue 67). With --train_file or --dataset_name and no size flag, pretrain.py:

    flags.py     which runs plan themselves, read by the flags' checks before torch loads
    ladder.py    the model sizes it chooses between, and the recipe tuned on real text
    law.py       the held-out loss a size reaches after so many tokens of a text of so many tokens, fitted
                 to the sweep in benchmarks/results/plan_sweep.jsonl (`python -m benchmarks.plan_sweep`)
    speed.py     tokens per second of a few sizes, measured on this machine in a few seconds
    choose.py    the plan: the size the law predicts best in the tokens the budget buys; its one-line
                 summary; the flags it sets (never one the user gave); the plan a resume reads back
"""
