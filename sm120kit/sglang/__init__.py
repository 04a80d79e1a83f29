"""SGLang trees: finding them, release downloads, work copies, git access, where each release keeps its launchers."""
