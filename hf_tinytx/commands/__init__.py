"""What a user types, and how every command ends:

    generate.py   `tinytx generate FOLDER "prompt"`: a prompt continued, streamed
    chat.py       `tinytx chat FOLDER`: a conversation over the folder's chat template
    flags.py      the flags of convert and interpret, parsed without torch
    exits.py      exit statuses, one line on bad input, stop signals (UserInputError lives here)
    signals.py    SIGINT and SIGTERM: their handlers set and restored, for every command and launcher
    quiet.py      notices a user cannot act on, silenced
"""
