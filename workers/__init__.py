"""Code that runs in a model worker process (the front's side is `stages/remote/`)."""
