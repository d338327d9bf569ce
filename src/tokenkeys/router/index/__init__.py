"""The prefix index: its protocol (``model``), backends (``memory``, ``redis``), metrics wrapper."""
