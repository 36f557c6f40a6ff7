-- train.lua: trains examples/gpt2/model.lua's GPT on token shards (llm.c's
-- .bin files, e.g. from prepare_brown.lua): AdamW (weight decay on the
-- matrices), linear warm-up then cosine decay of the learning rate,
-- gradient clipping, gradient accumulation, bf16 autocast, validation
-- loss, checkpoints that resume, and tokens/s and MFU in the progress
-- line. Runs alone or under the launcher, with DDP, or with --fsdp the
-- blocks' parameters sharded over the ranks (FullyShardedDataParallel):
--
--   dplua examples/gpt2/train.lua --steps=2000 --ckpt=gpt2.safetensors
--   dplua --nproc_per_node=8 examples/gpt2/train.lua --batch_size=16 --grad_accum=4
--   dplua --nproc_per_node=8 examples/gpt2/train.lua --fsdp
--   dplua examples/gpt2/train.lua --help
--
-- Options are --name=value or --name value (options.lua); --help lists them.
local torch = require("dplua")
local nn = torch.nn
local dist = torch.distributed
local data = torch.utils.data

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local gpt = dofile(here .. "/model.lua")
local options = dofile(here .. "/options.lua")

---------------------------------------------------------------- options

-- name, default, what (a number default makes a number option, a boolean a flag)
local OPTIONS = {
  { "train", here .. "/data/brown_train.bin", "training shards: a path, or several separated by commas" },
  { "val", here .. "/data/brown_val.bin", "validation shards (empty: no validation)" },
  { "n_layer", 12, "layers (depth)" },
  { "n_head", 12, "attention heads" },
  { "n_embd", 768, "width" },
  { "vocab_size", 50304, "vocabulary (GPT-2's 50257, padded to a multiple of 64)" },
  { "dropout", 0.0, "dropout probability" },
  { "batch_size", 8, "sequences per micro-batch and rank (B)" },
  { "seq_len", 1024, "tokens per sequence (T), also the model's block size" },
  { "grad_accum", 1, "micro-batches per step" },
  { "steps", 1000, "optimizer steps" },
  { "lr", 6e-4, "peak learning rate" },
  { "min_lr", 6e-5, "learning rate at the end of the cosine decay" },
  { "warmup", 100, "steps of linear warm-up" },
  { "weight_decay", 0.1, "AdamW weight decay of the matrices" },
  { "clip", 1.0, "gradient norm clip (0: none)" },
  { "device", "auto", "cpu, cuda, or auto (cuda when available)" },
  { "dtype", "bf16", "bf16 (autocast; parameters stay float32) or fp32" },
  { "eval_interval", 250, "steps between validation losses and checkpoints (0: only at the end)" },
  { "eval_steps", 20, "validation batches per evaluation" },
  { "log_interval", 10, "steps between progress lines" },
  { "ckpt", "", "checkpoint path (.safetensors): written at each evaluation and at the end" },
  { "resume", false, "continue from --ckpt when it exists" },
  { "fsdp", false, "shard each block's parameters over the ranks (every block's LayerNorm and biases then decay too)" },
  { "fsdp_strategy", "FULL_SHARD", "under --fsdp: FULL_SHARD (a block's forward runs again in its backward) or " ..
                                   "SHARD_GRAD_OP (its graph and gathered parameters kept until its backward)" },
  { "peak_tflops", 0, "the device's peak bf16 TFLOP/s for MFU (0: known GPUs' from their name)" },
  { "seed", 1337, "random seed" },
}

local function fail(msg) options.fail("train.lua", msg) end

local function parse(args)
  local opt = options.parse("train.lua", OPTIONS, args)
  options.positive_ints("train.lua", opt, { "n_layer", "n_head", "n_embd", "vocab_size", "batch_size", "seq_len",
                                            "grad_accum", "steps" })
  if opt.dtype ~= "bf16" and opt.dtype ~= "fp32" then fail("--dtype is bf16 or fp32, got '" .. opt.dtype .. "'") end
  if opt.resume and opt.ckpt == "" then fail("--resume needs --ckpt=PATH") end
  if opt.fsdp_strategy ~= "FULL_SHARD" and opt.fsdp_strategy ~= "SHARD_GRAD_OP" then
    fail("--fsdp_strategy is FULL_SHARD or SHARD_GRAD_OP, got '" .. opt.fsdp_strategy .. "'")
  end
  if opt.fsdp and os.getenv("WORLD_SIZE") == nil then
    fail("--fsdp shards over the ranks of a launch: dplua --nproc_per_node=N examples/gpt2/train.lua --fsdp")
  end
  return opt
end

local function split_paths(s)
  local list = {}
  for p in s:gmatch("[^,]+") do list[#list + 1] = p end
  return list
end

---------------------------------------------------------------- the run

-- The device's peak bf16 TFLOP/s: --peak_tflops, else a known GPU's.
local function peak_tflops(opt, device)
  if opt.peak_tflops > 0 then return opt.peak_tflops end
  if device.type ~= "cuda" then return nil end
  return gpt.peak_bf16_tflops(torch.cuda.get_device_name(device.index or 0))
end

-- Linear warm-up to lr over `warmup` steps, then cosine decay to min_lr at the last step.
local function lr_at(opt, step)
  if step < opt.warmup then return opt.lr * (step + 1) / opt.warmup end
  if step >= opt.steps - 1 or opt.steps <= opt.warmup then return opt.min_lr end
  local ratio = (step - opt.warmup) / (opt.steps - 1 - opt.warmup)
  return opt.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (opt.lr - opt.min_lr)
end

local function main(args)
  local opt = parse(args)
  local use_cuda = opt.device == "cuda" or (opt.device == "auto" and torch.cuda.is_available())
  if not use_cuda and opt.device ~= "cpu" and opt.device ~= "auto" then fail("--device is cpu, cuda or auto") end
  local distributed = os.getenv("WORLD_SIZE") ~= nil
  local rank, world = 0, 1
  if distributed then
    dist.init_process_group(use_cuda and "nccl" or "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
  end
  local device = torch.device(use_cuda and ("cuda:" .. (distributed and dist.get_local_rank() or 0)) or "cpu")
  if use_cuda then torch.cuda.set_device(device.index or 0) end
  local master = rank == 0
  local function say(...) if master then print(string.format(...)) end end
  torch.manual_seed(opt.seed + rank)

  local T, B = opt.seq_len, opt.batch_size
  local train_ds = data.TokenShards{ files = split_paths(opt.train), block_size = T, batch_size = B,
                                     shuffle = true, seed = opt.seed, device = device }
  local val_ds = opt.val ~= "" and data.TokenShards{ files = split_paths(opt.val), block_size = T, batch_size = B,
                                                     device = device } or nil

  local model = gpt.GPT({ n_layer = opt.n_layer, n_head = opt.n_head, n_embd = opt.n_embd, vocab_size = opt.vocab_size,
                          block_size = T, dropout = opt.dropout })
  model:to(device)
  local num_params, flops_per_token = model:get_num_params(), model:flops_per_token(T)
  local step, epoch, batch = 0, 0, 0      -- the next step, and where the data stand
  local exists = io.open(opt.ckpt, "rb")
  if exists then exists:close() end
  local ck = opt.resume and exists and torch.load(opt.ckpt, { map_location = device }) or nil
  if ck then model:load_state_dict(ck.model) end
  local ddp, sharded, optimizer
  if opt.fsdp then
    model.call_blocks = true   -- each block called as a whole: its parameters exist only inside its call
    sharded = dist.fsdp.FullyShardedDataParallel(model, { auto_wrap_policy = dist.fsdp.ModuleWrapPolicy({ gpt.Block }),
                                                          sharding_strategy = opt.fsdp_strategy })
    local decay, no_decay = {}, {}
    for _, e in ipairs(sharded:named_parameters()) do
      local p = e[2]
      if e[1]:match("_flat_shard$") or p:dim() >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
    end
    optimizer = torch.optim.AdamW({ { params = decay, weight_decay = opt.weight_decay },
                                    { params = no_decay, weight_decay = 0 } }, { lr = opt.lr, betas = { 0.9, 0.95 } })
  else
    ddp = distributed and world > 1 and nn.parallel.DistributedDataParallel(model) or nil
    optimizer = model:configure_optimizers(opt.weight_decay, opt.lr, { 0.9, 0.95 })
  end
  if ck then
    -- (under --fsdp the state is by parameter name: any number of ranks takes its shards of it)
    optimizer:load_state_dict(sharded and sharded:optim_state_dict_to_load(optimizer, ck.optimizer) or ck.optimizer)
    step, epoch, batch = ck.step, ck.epoch, ck.batch
    torch.set_rng_state(ck.rng)
    say("resumed from %s at step %d", opt.ckpt, step)
  end
  train_ds:set_epoch(epoch)

  local amp = opt.dtype == "bf16"
  local amp_opts = { dtype = torch.bfloat16 }
  local x, y
  local function forward() return select(2, (ddp or sharded or model)(x, y)) end
  local function loss_of()
    if amp then return torch.autocast(device.type, amp_opts, forward) end
    return forward()
  end
  local function next_batch()
    if batch >= #train_ds then
      epoch, batch = epoch + 1, 0
      train_ds:set_epoch(epoch)
    end
    x, y = train_ds:__getitem(batch)
    batch = batch + 1
  end

  local function evaluate()
    if not val_ds then return nil end
    model:eval()
    local total = torch.no_grad(function()
      local sum = 0
      local n = math.min(opt.eval_steps, #val_ds)
      for j = 0, n - 1 do
        x, y = val_ds:__getitem(j)
        sum = sum + loss_of():item()
      end
      return sum / n
    end)
    model:train()
    if distributed then   -- the mean over the ranks, each of which read its own windows
      local t = torch.tensor({ total }, { device = device })
      dist.all_reduce(t)
      total = t:item() / world
    end
    return total
  end

  local function save()
    if opt.ckpt == "" then return end
    -- (under --fsdp every rank gathers the whole model and the optimizer state by parameter name)
    local state = sharded and sharded:state_dict() or model:state_dict({ keep_vars = true })
    local optim_state = sharded and sharded:optim_state_dict(optimizer) or optimizer:state_dict()
    if master then
      torch.save({ model = state, optimizer = optim_state,
                   step = step, epoch = epoch, batch = batch, rng = torch.get_rng_state(),
                   config = model.config }, opt.ckpt)
    end
    if distributed then dist.barrier() end
    say("saved %s at step %d", opt.ckpt, step)
  end

  local peak = peak_tflops(opt, device)
  local tokens_per_step = B * T * opt.grad_accum * world
  say("GPT: %d layers, %d heads, width %d, %.2fM parameters; %d tokens a step (%d x %d x %d accum x %d ranks); %s, %s",
      opt.n_layer, opt.n_head, opt.n_embd, num_params / 1e6, tokens_per_step, B, T, opt.grad_accum, world,
      tostring(device), amp and "bf16 autocast" or "fp32")
  if not peak and master then print("MFU: unknown peak for this device (give --peak_tflops)") end

  local sync = use_cuda and torch.cuda.synchronize or function() end
  local clock = require("dplua.utils.progress").clock
  local t0, timed_from = clock(), step     -- the time since the last progress line, and its first step
  while step < opt.steps do
    local lr = lr_at(opt, step)
    for _, g in ipairs(optimizer.param_groups) do g.lr = lr end
    optimizer:zero_grad()
    local loss_sum
    for micro = 1, opt.grad_accum do
      next_batch()
      local loss
      if (ddp or sharded) and micro < opt.grad_accum then   -- gradients of earlier micro-batches stay local
        (ddp or sharded):no_sync(function() loss = loss_of() / opt.grad_accum; loss:backward() end)
      else
        loss = loss_of() / opt.grad_accum
        loss:backward()
      end
      loss_sum = loss_sum and loss_sum + loss:detach() or loss:detach()
    end
    local norm
    if opt.clip > 0 then
      norm = sharded and sharded:clip_grad_norm_(opt.clip) or nn.utils.clip_grad_norm_(model:parameters(), opt.clip)
    end
    optimizer:step()
    step = step + 1
    if step % opt.log_interval == 0 or step == opt.steps or step == 1 then
      local loss = loss_sum:item()
      sync()
      local t1 = clock()
      local dt = (t1 - t0) / (step - timed_from)
      t0, timed_from = t1, step
      local tok_s = tokens_per_step / dt
      local mfu = peak and string.format("%.1f%%", 100 * flops_per_token * tok_s / (world * peak * 1e12)) or "-"
      say("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | MFU %s",
          step, opt.steps, loss, lr, norm and norm:item() or 0, dt * 1000, tok_s, mfu)
    end
    if opt.eval_interval > 0 and step % opt.eval_interval == 0 and step < opt.steps then
      local v = evaluate()
      if v then say("step %5d | val loss %.4f", step, v) end
      save()
      sync()
      t0, timed_from = clock(), step
    end
  end
  local v = evaluate()
  if v then say("step %5d | val loss %.4f", step, v) end
  save()
  if distributed then dist.destroy_process_group() end
end

main(arg)
