"""Run results on disk: the streamed record log and run.json."""
