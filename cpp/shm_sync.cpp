// TEMPORARY: shared-memory synchronisation primitives land with the shm channel.
