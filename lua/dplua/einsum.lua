-- dplua.einsum: torch.einsum(equation, operands...) as views, sums and
-- batched products, so that every device and autograd come with it.
--
--   torch.einsum("bij,bjk->bik", a, b)     -- bmm
--   torch.einsum("ii", m)                   -- trace
--   torch.einsum("...ij,...jk", a, b)       -- implicit output, broadcast batch dims
--
-- Labels repeated within one operand take its diagonal; labels that no
-- other operand and not the output name are summed at once; the operands
-- are then contracted left to right, each pair as one batched product over
-- the labels they share that nothing later needs. Dims of one label must
-- have one size or size 1 (broadcast).
local B = require("dplua.base")
local torch = B.torch
local raise, is_tensor, typename = B.raise, B.is_tensor, B.typename

local M = {}

-- One side of the equation's terms: a list of labels, with "..." as the
-- single entry "..." where it stands.
local function parse_term(term, fn)
  local labels, i, seen_ellipsis = {}, 1, false
  while i <= #term do
    local c = term:sub(i, i)
    if term:sub(i, i + 2) == "..." then
      if seen_ellipsis then raise(fn .. ": an ellipsis may appear only once in a term, got '" .. term .. "'") end
      seen_ellipsis = true
      labels[#labels + 1] = "..."
      i = i + 3
    elseif c:match("%a") then
      labels[#labels + 1] = c
      i = i + 1
    else
      raise(string.format("%s: expected letters and '...' in the equation, got '%s' in '%s'", fn, c, term))
    end
  end
  return labels
end

-- The labels of an operand of nd dims with "..." spread over its
-- ellipsis dims, named "..1", "..2", ... right-aligned to the widest
-- ellipsis of E dims.
local function spread(labels, nd, E, k, fn)
  local letters = 0
  for _, l in ipairs(labels) do if l ~= "..." then letters = letters + 1 end end
  local has = false
  for _, l in ipairs(labels) do if l == "..." then has = true end end
  local e = nd - letters
  if (not has and e ~= 0) or e < 0 then
    raise(string.format("%s: operand %d has %d dims but its term names %d%s", fn, k - 1, nd, letters,
                        has and " besides its ellipsis" or " and has no ellipsis"))
  end
  local out = {}
  for _, l in ipairs(labels) do
    if l == "..." then
      for j = E - e + 1, E do out[#out + 1] = ".." .. j end
    else
      out[#out + 1] = l
    end
  end
  return out, e
end

local function index_of(list, x)
  for i, v in ipairs(list) do if v == x then return i end end
end

-- Takes the diagonal of every pair of dims that share a label.
local function diagonals(t, labels)
  while true do
    local a, b
    for i = 1, #labels do
      for j = i + 1, #labels do
        if labels[i] == labels[j] then a, b = i, j; break end
      end
      if a then break end
    end
    if not a then return t, labels end
    t = t:diagonal(0, a - 1, b - 1)
    local l = labels[a]
    table.remove(labels, b)
    table.remove(labels, a)
    labels[#labels + 1] = l
  end
end

-- Sums t over its dims whose labels `keep` does not hold.
local function sum_unneeded(t, labels, keep)
  for i = #labels, 1, -1 do
    if not keep[labels[i]] then
      t = t:sum(i - 1)
      table.remove(labels, i)
    end
  end
  return t, labels
end

-- One batched product of a and b: the shared labels keep holds are batch
-- dims, the other shared ones contracted.
local function contract(a, la, b, lb, keep, size)
  local inb = {}
  for _, l in ipairs(lb) do inb[l] = true end
  local ina = {}
  for _, l in ipairs(la) do ina[l] = true end
  local batch, left, summed, right = {}, {}, {}, {}
  for _, l in ipairs(la) do
    if inb[l] then
      if keep[l] then batch[#batch + 1] = l else summed[#summed + 1] = l end
    else
      left[#left + 1] = l
    end
  end
  for _, l in ipairs(lb) do if not ina[l] then right[#right + 1] = l end end
  local function arrange(t, labels, order)
    local perm, shape = {}, {}
    for i, l in ipairs(order) do
      perm[i] = index_of(labels, l) - 1
      shape[i] = size[l]
    end
    return t:permute(perm):expand(shape)
  end
  local function count(list)
    local n = 1
    for _, l in ipairs(list) do n = n * size[l] end
    return n
  end
  local oa, ob = {}, {}
  for _, group in ipairs({ batch, left, summed }) do for _, l in ipairs(group) do oa[#oa + 1] = l end end
  for _, group in ipairs({ batch, summed, right }) do for _, l in ipairs(group) do ob[#ob + 1] = l end end
  local nb, nl, ns, nr = count(batch), count(left), count(summed), count(right)
  local p = arrange(a, la, oa):reshape(nb, nl, ns):bmm(arrange(b, lb, ob):reshape(nb, ns, nr))
  local labels, shape = {}, {}
  for _, group in ipairs({ batch, left, right }) do
    for _, l in ipairs(group) do labels[#labels + 1] = l; shape[#shape + 1] = size[l] end
  end
  return p:reshape(shape), labels
end

function M.einsum(equation, ...)
  local fn = "einsum"
  if type(equation) ~= "string" then raise(fn .. ": expected the equation as the first argument, got " .. typename(equation)) end
  local ops = { ... }
  if #ops == 1 and type(ops[1]) == "table" and not is_tensor(ops[1]) then ops = ops[1] end
  for i, t in ipairs(ops) do
    if not is_tensor(t) then raise(string.format("%s: expected operand %d to be a tensor, got %s", fn, i - 1, typename(t))) end
  end
  local eq = equation:gsub("%s", "")
  local lhs, rhs = eq:match("^(.-)%->(.*)$")
  if not lhs then lhs = eq end
  local terms = {}
  for term in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = parse_term(term, fn) end
  if #terms ~= #ops then
    raise(string.format("%s: the equation names %d operands but %d were given", fn, #terms, #ops))
  end
  -- the widest ellipsis, then every operand's labels and the label sizes
  local E = 0
  for k, labels in ipairs(terms) do
    local letters = 0
    for _, l in ipairs(labels) do if l ~= "..." then letters = letters + 1 end end
    E = math.max(E, ops[k]:dim() - letters)
  end
  local size, labels_of, count = {}, {}, {}
  for k, t in ipairs(ops) do
    local labels = spread(terms[k], t:dim(), E, k, fn)
    labels_of[k] = labels
    for i, l in ipairs(labels) do
      local s = t:size(i - 1)
      if size[l] == nil or size[l] == 1 then size[l] = s
      elseif s ~= 1 and s ~= size[l] then
        raise(string.format("%s: label '%s' has size %d in operand %d but %d elsewhere", fn, l:sub(1, 2) == ".." and
                            "..." or l, s, k - 1, size[l]))
      end
      count[l] = (count[l] or 0) + 1
    end
  end
  -- the output's labels: given, or the ellipsis then the letters named once, sorted
  local out = {}
  if rhs then
    for _, l in ipairs(parse_term(rhs, fn)) do
      if l == "..." then
        for j = 1, E do out[#out + 1] = ".." .. j end
      else
        if not count[l] then raise(string.format("%s: output label '%s' names no operand's dim", fn, l)) end
        if index_of(out, l) then raise(string.format("%s: output label '%s' appears twice", fn, l)) end
        out[#out + 1] = l
      end
    end
  else
    for j = 1, E do out[#out + 1] = ".." .. j end
    local once = {}
    for l, n in pairs(count) do if n == 1 and l:sub(1, 2) ~= ".." then once[#once + 1] = l end end
    table.sort(once)
    for _, l in ipairs(once) do out[#out + 1] = l end
  end
  for j = 1, E do size[".." .. j] = size[".." .. j] or 1 end
  -- diagonals, then contractions left to right
  local function needed_after(k)
    local keep = {}
    for _, l in ipairs(out) do keep[l] = true end
    for j = k + 1, #ops do for _, l in ipairs(labels_of[j]) do keep[l] = true end end
    return keep
  end
  local cur, cl = diagonals(ops[1], labels_of[1])
  for k = 2, #ops do
    local t, l = diagonals(ops[k], labels_of[k])
    local keep = needed_after(k)
    local with_other = {}
    for x in pairs(keep) do with_other[x] = true end
    for _, x in ipairs(l) do with_other[x] = true end
    cur, cl = sum_unneeded(cur, cl, with_other)
    local mine = {}
    for x in pairs(keep) do mine[x] = true end
    for _, x in ipairs(cl) do mine[x] = true end
    t, l = sum_unneeded(t, l, mine)
    cur, cl = contract(cur, cl, t, l, keep, size)
  end
  local keep = {}
  for _, l in ipairs(out) do keep[l] = true end
  cur, cl = sum_unneeded(cur, cl, keep)
  local perm, shape = {}, {}
  for i, l in ipairs(out) do
    perm[i] = index_of(cl, l) - 1
    shape[i] = size[l]
  end
  if #perm == 0 then return cur end
  return cur:permute(perm):expand(shape)
end

return M
