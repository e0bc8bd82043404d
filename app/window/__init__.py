"""The main window and what is around it: the sidebar, the status area, the context gauge,
file and model actions, the program's entry point (main), logs, the first-start check
(system_check), the frozen program's self-test and screenshots."""
