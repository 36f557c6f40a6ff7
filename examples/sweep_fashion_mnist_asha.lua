-- sweep_fashion_mnist_asha.lua: the Fashion-MNIST sweep with early
-- stopping. Twelve configurations of six epochs each; ASHA (rungs at
-- epochs 1, 3 and 9, capped at 6 by max_t: 1 and 3) stops the trials
-- whose test accuracy falls in the worse two thirds at a rung, so most
-- of the sweep's time goes to the promising ones.
--
--   dplua sweep examples/sweep_fashion_mnist_asha.lua
--
-- Without `scheduler` the same sweep runs every trial to its end (compare
-- the wall time to the best configuration, and the best accuracy: see
-- docs/SWEEPS.md). Each trial is examples/sweep_trial_fashion_mnist.lua,
-- which reports every epoch's test accuracy with its epoch number.
return {
  script = "sweep_trial_fashion_mnist.lua",
  space = {
    lr = { 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2 },
    batch_size = { 64, 256 },
    epochs = 6,
  },
  metric = "test_accuracy",
  mode = "max",
  parallel = 1,
  timeout = 900,
  scheduler = { "asha", time_attr = "epoch", grace_period = 1, reduction_factor = 3, max_t = 6 },
}
