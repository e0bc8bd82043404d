"""Dialogs: settings, a conversation's settings, the model picker."""
