"""The commands resource: exec, background commands, terminals and their kills."""
