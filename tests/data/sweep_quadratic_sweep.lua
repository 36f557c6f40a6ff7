-- sweep_quadratic_sweep.lua: the sweep of tests/sh/test_sweep.sh (which
-- copies it and sweep_quadratic.lua to a temporary folder and runs it
-- there, so that results and logs land beside the copy).
return {
  script = "sweep_quadratic.lua",
  space = { x = {0, 1, 2, 3}, y = {-2, 0} },
  metric = "loss", mode = "min",
  parallel = 2,
  timeout = 60,
}
