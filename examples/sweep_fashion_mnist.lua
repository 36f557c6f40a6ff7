-- sweep_fashion_mnist.lua: sweep the learning rate and batch size of the
-- Fashion-MNIST MLP (examples/fashion_mnist.lua, in a short mode).
--
--   dplua sweep examples/sweep_fashion_mnist.lua               # 6 trials
--   dplua sweep examples/sweep_fashion_mnist.lua --parallel 2  # two at once
--
-- Each trial runs examples/sweep_trial_fashion_mnist.lua, which reads its
-- values with torch.hparams and reports its test accuracy with
-- torch.report. Results go to examples/sweep_fashion_mnist.results.jsonl
-- and logs to examples/sweep_fashion_mnist.logs/; run it again and the
-- finished trials are skipped. On a GPU machine one trial runs per GPU.
return {
  script = "sweep_trial_fashion_mnist.lua",
  space = {
    lr = { 3e-4, 1e-3, 3e-3 },
    batch_size = { 64, 128 },
  },
  metric = "test_accuracy",
  mode = "max",
  timeout = 600,
}
