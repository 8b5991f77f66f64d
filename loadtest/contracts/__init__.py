"""Typed contracts for what crosses a file or a process: the record-log line, the master/worker messages."""
