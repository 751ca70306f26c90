"""The Ray wing: a bundle served over HTTP on Ray Serve (`serve`) and run over files on Ray
Data (`data`), in the Ray session `session` starts or joins and stops. Only `vit-export
serve` and `infer --ray` (`vit_export.serve`, `vit_export.infer(ray=True)`) load it.

Ray's process rules live here and nowhere else: Ray's orphans are reaped (a child
subreaper and a guard that ends them), a shutdown that hangs is cut short, and a process in
which Ray's driver ran leaves by `session.exit_process`, skipping the C library's exit
handlers, which crash under Ray's core worker. The rest of the package never exits the
process."""
