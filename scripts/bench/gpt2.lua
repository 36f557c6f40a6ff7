-- scripts/bench/gpt2.lua: a GPT-2 124M training step on one GPU
-- (examples/gpt2/model.lua: 12 layers, 12 heads, width 768, vocabulary
-- 50304), batch B x 1024 tokens, bf16 autocast, AdamW (betas 0.9/0.95,
-- weight decay 0.1 on the matrices), clip_grad_norm_(1.0). Prints "name
-- value" lines for scripts/bench/gpt2: ms per step (the mean of STEPS
-- timed steps between two synchronize() calls, after 3 untimed ones),
-- tokens/s, MFU (6N + 12 L T C FLOPs a token against the GPU's bf16 peak)
-- and max_memory_allocated in MiB; gpt2.py is the same on PyTorch. The
-- one-GPU run also prints "ddp_ranks N", the GPUs it sees.
--   dplua scripts/bench/gpt2.lua [B [STEPS]]
-- With "ddp", under the launcher: the same step under
-- DistributedDataParallel, one rank per GPU (cuda:LOCAL_RANK, NCCL), batch
-- B on every rank; only rank 0 prints: ms per step (the slowest rank's),
-- tokens/s over all ranks, MFU over all GPUs and the largest rank's
-- max_memory_allocated.
--   dplua --nproc_per_node=N scripts/bench/gpt2.lua B STEPS ddp
-- With "fsdp", the same under dist.fsdp.FullyShardedDataParallel, each
-- Block a unit (FULL_SHARD: a block's parameters gathered for its forward
-- and for its recomputation in backward); "fsdp_grad_op" with
-- SHARD_GRAD_OP (a block's graph and gathered parameters kept from its
-- forward to its backward).
-- DPLUA_BENCH_TINY=1: a tiny model (2 layers, width 64, 1024 -> 64
-- tokens, vocabulary 512) on the CPU (Gloo for "ddp", and ddp_ranks 2),
-- so that the script can be checked where there is no GPU.
local torch = require("dplua")
local dist = torch.distributed
local tiny = os.getenv("DPLUA_BENCH_TINY") == "1"
if not tiny then
  local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
  if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end
end
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local gpt = dofile(here .. "/../../examples/gpt2/model.lua")
local clock = torch.utils.progress.clock

local B, steps = tonumber(arg[1]) or 8, tonumber(arg[2]) or 20
local mode = arg[3]
local strategies = { fsdp = "FULL_SHARD", fsdp_grad_op = "SHARD_GRAD_OP" }
if mode ~= nil and mode ~= "ddp" and not strategies[mode] then
  error("gpt2.lua: the third argument is \"ddp\", \"fsdp\", \"fsdp_grad_op\" or nothing, got " .. mode, 0)
end
local ddp = mode ~= nil   -- (both run under the launcher, one rank per GPU)
local config = tiny and { n_layer = 2, n_head = 4, n_embd = 64, block_size = 64, vocab_size = 512 }
  or { block_size = 1024 }
local T, n_tokens = config.block_size, tiny and 512 or 50257
-- only rank 0's lines reach the table: the others say nothing on stdout
local rank = ddp and tonumber(os.getenv("RANK") or "0") or 0
local world = ddp and tonumber(os.getenv("WORLD_SIZE") or "1") or 1
local function say(fmt, ...) if rank == 0 then print(string.format(fmt, ...)) end end
local name = tiny and "cpu" or torch.cuda.get_device_name(0)   -- rank 0's GPU: its bf16 peak is MFU's denominator
say("version dplua on %s, batch %d x %d, %d steps%s", name, B, T, steps,
    ddp and string.format(", %s over %d ranks (%s)", strategies[mode] and "FSDP " .. strategies[mode] or "DDP", world,
                          tiny and "gloo" or "nccl") or "")
if not ddp and rank == 0 then print("ddp_ranks " .. (tiny and 2 or torch.cuda.device_count())) end

local ok, err = pcall(function()
  local device = tiny and "cpu" or "cuda"
  if ddp then
    dist.init_process_group(tiny and "gloo" or "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not tiny then
      device = "cuda:" .. dist.get_local_rank()
      torch.cuda.set_device(device)
    end
  end
  local function sync() if not tiny then torch.cuda.synchronize() end end
  -- the largest of the ranks' values (one rank: its own)
  local function max_over_ranks(v)
    if not ddp then return v end
    local t = torch.tensor({ v }, { dtype = torch.float64 }):to(device)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return t:item()
  end
  torch.manual_seed(0)
  if not tiny then torch.cuda.reset_peak_memory_stats() end
  local model = gpt.GPT(config):to(device)
  local flops_per_token = model:flops_per_token(T)
  local run, opt, clip
  if strategies[mode] then
    model.call_blocks = true
    run = dist.fsdp.FullyShardedDataParallel(model, { auto_wrap_policy = dist.fsdp.ModuleWrapPolicy({ gpt.Block }),
                                                      sharding_strategy = strategies[mode] })
    opt = torch.optim.AdamW(run:parameters(), { lr = 6e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
    clip = function() run:clip_grad_norm_(1.0) end
  else
    run = ddp and torch.nn.parallel.DistributedDataParallel(model) or model
    opt = model:configure_optimizers(0.1, 6e-4, { 0.9, 0.95 })
    clip = function() torch.nn.utils.clip_grad_norm_(model:parameters(), 1.0) end
  end
  if ddp then torch.manual_seed(1 + rank) end   -- a batch of its own on every rank
  local x = torch.randint(0, n_tokens, { B, T }):to(device)
  local y = torch.randint(0, n_tokens, { B, T }):to(device)
  local amp = { dtype = torch.bfloat16 }
  local function forward() return select(2, run(x, y)) end
  local function step()
    opt:zero_grad()
    local loss = torch.autocast(tiny and "cpu" or "cuda", amp, forward)
    loss:backward()
    clip()
    opt:step()
  end
  for _ = 1, 3 do step() end
  sync()
  if ddp then dist.barrier() end
  local t0 = clock()
  for _ = 1, steps do step() end
  sync()
  local s = max_over_ranks((clock() - t0) / steps)
  local tok_s = world * B * T / s
  say("ms %.3f", s * 1000)
  say("tok_s %.1f", tok_s)
  local peak = gpt.peak_bf16_tflops(name)
  if peak then say("mfu %.2f", 100 * flops_per_token * tok_s / (world * peak * 1e12))
  else say("mfu error: unknown bf16 peak for %s", name) end
  if tiny then say("mem_mib error: no max_memory_allocated on the CPU (DPLUA_BENCH_TINY)")
  else say("mem_mib %.1f", max_over_ranks(torch.cuda.max_memory_allocated()) / 2 ^ 20) end
end)
if not ok then
  local msg = (tostring(err):gsub("%s*\n%s*", " | "))
  if rank == 0 then
    for _, row in ipairs({ "ms", "tok_s", "mfu", "mem_mib" }) do print(row .. " error: " .. msg) end
  else
    io.stderr:write(string.format("gpt2.lua: rank %d: %s\n", rank, msg))
  end
end
if ddp and dist.is_initialized() then pcall(dist.destroy_process_group) end
