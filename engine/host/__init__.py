"""One engine per host: the engine cores and front end in a process of their own, kept after the
processes that use it are gone (``keep_alive``), attached to by any process of the user
(docs/host.md). :mod:`.directory` (where engines are found), :mod:`.wire` (what crosses the
socket), :mod:`.owner` (the host process), :mod:`.attach` and :mod:`.attached` (the app's side),
:mod:`.status` (what is shown of an engine)."""
