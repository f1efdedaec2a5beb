"""The runner: the `workbench` command (`cli`, its console entry point `cli.entry`), the harness
that runs one study into a run folder (`harness`), the run folder as a transaction
(`run_folder`), `--FIELD VALUE` overrides (`overrides`), `workbench tour` (`tour`) and its worker
processes (`workers`). Studies never import it; it imports a study by its module path in
`studies.STUDIES`."""
