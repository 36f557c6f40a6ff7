-- sweep_fashion_mnist_tpe.lua: the Fashion-MNIST sweep as a model-based
-- search. Sixteen trials of six epochs: the first six draw the learning
-- rate (on a log scale) and the batch size at random, then each next one
-- is chosen by the tree-structured Parzen estimator from the test
-- accuracies so far; ASHA still stops the trials that fall behind at
-- epochs 1 and 3, and a stopped trial counts as a poor one for the next
-- choice.
--
--   dplua sweep examples/sweep_fashion_mnist_tpe.lua
--
-- Run it again with a larger `samples` and it keeps its trials and
-- chooses only the new ones (docs/SWEEPS.md#model-based-search-tpe). Each
-- trial is examples/sweep_trial_fashion_mnist.lua.
return {
  script = "sweep_trial_fashion_mnist.lua",
  method = "tpe",
  samples = 16,
  seed = 1,
  tpe = { startup = 6 },
  space = {
    lr = { log_uniform = { 1e-4, 3e-2 } },
    batch_size = { 64, 128, 256 },
    epochs = 6,
  },
  metric = "test_accuracy",
  mode = "max",
  parallel = 1,
  timeout = 900,
  scheduler = { "asha", time_attr = "epoch", grace_period = 1, reduction_factor = 3, max_t = 6 },
}
