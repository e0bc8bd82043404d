"""The engine as a service: the messages between a front end and the engine (protocol), the
engine side that answers them (handler), the engine's own process (process), the client
that front ends use (client), the command line's facade (session) and scripted replays
(replay, scenario)."""
