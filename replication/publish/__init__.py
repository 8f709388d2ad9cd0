"""The writer's side: a process's written facts onto the channel layer and Synapse's Redis channel."""
