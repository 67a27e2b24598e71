"""The fork server's last preloaded import (:data:`.vllm_processes.PRELOAD`): its imports are
done, so its parent-death signal goes (:func:`.fork_server_guard.disarm`)."""

from vllm_inline.engine.seam.fork_server_guard import disarm

disarm()
