"""The one path from a request to the token ids an engine receives.

``Preprocessor`` (one per served model) normalizes text, renders chats (the prologue in
``chat``, ``chat_messages``, ``chat_tools``), encodes, and is shared by generation and by every
tokenize report. ``completion`` and ``prompt_options`` hold the rules for what a prompt may ask
that the generation path does not do exactly (answered 501, never approximated).
"""

from tokenkeys.preprocess.preprocessor import ChatTokenized, Preprocessor, Tokenized

__all__ = ["ChatTokenized", "Preprocessor", "Tokenized"]
