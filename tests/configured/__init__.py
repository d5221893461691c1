"""A project locked only through ``redislock_tasks``: its task modules never mention the library."""
