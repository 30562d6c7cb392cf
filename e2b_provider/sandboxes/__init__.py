"""The sandboxes resource: create, resume, suspend, destroy and list whole sandboxes."""
