"""The live debugger's sessions (:mod:`.debugger`, pure) and their REST routes
(:mod:`.debug_rest`), registered by the app ``apps/live_debugger.py``."""
