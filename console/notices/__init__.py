"""Notices that reach people: the console's inbox (站内信), mail and SMS, in the recipient's
language, once per event (a building block of the console: apps call ``services.notify``)."""
