"""The engine's host half: the scheduler that drives the device functions, the one owner of
the sequences (slots, waiting, parked, preempted), the page policy and the page allocator."""
