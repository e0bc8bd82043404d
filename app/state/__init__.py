"""The window's state without widgets: the open conversations (controller), the engine's side
of a reply (replies) over the engine client (engine_client, engine_thread), the window's API
server (api_server) and imports off the GUI thread (importer)."""
