"""The Lua scripts of the Redis prefix index (layout: ``index.redis``).

Each runs on the keys of one shard (one hash tag, so one cluster slot) and is atomic there.
"""

from tokenkeys.router.index.redis_store import Script

# KEYS: the shard's workers set (it routes the call to the shard's node); ARGV: the shard's
# key prefix, the ttl in ms (0: none), then groups of four: op ('a' add, 'r' remove), worker,
# tier, the block keys as comma-joined decimals. The writes of many event batches (any
# workers) go as one call per shard, applied in order; the names are built here, as WALK does,
# because a client encodes (and a cluster client hashes) every key apart. All keys share the
# tag of KEYS[1], so the script stays within its slot. An add sets the worker's tiers of each
# block (sorted, comma-joined), adds the block to the worker's key set and the worker to the
# workers set, refreshing expiries with a ttl; a remove takes the tier off, the block off the
# worker's set when no tier is left, and the worker off the workers set when its set is empty.
# Server time is the ingest's bound on a cluster: a new block costs one HSETNX, the worker's
# set one SADD per thousand blocks (the tier merge only when the worker already holds it).
WRITE = Script(
    """
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local function members(cmd, set, ids)
  for i = 1, #ids, 1000 do
    redis.call(cmd, set, unpack(ids, i, math.min(i + 999, #ids)))
  end
end
for g = 3, #ARGV, 4 do
  local op, worker, tier = ARGV[g], ARGV[g + 1], ARGV[g + 2]
  local wset = prefix .. 'w:' .. worker
  local ids = {}
  for id in string.gmatch(ARGV[g + 3], '[^,]+') do
    local key = prefix .. 'b:' .. id
    if op == 'a' then
      ids[#ids + 1] = id
      if redis.call('HSETNX', key, worker, tier) == 0 then
        local cur = redis.call('HGET', key, worker)
        if cur ~= tier then
          local list, found = {}, false
          for t in string.gmatch(cur, '[^,]+') do
            if t == tier then found = true end
            list[#list + 1] = t
          end
          if not found then
            list[#list + 1] = tier
            table.sort(list)
            redis.call('HSET', key, worker, table.concat(list, ','))
          end
        end
      end
      if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
    else
      local cur = redis.call('HGET', key, worker)
      if cur == tier then
        redis.call('HDEL', key, worker)
        ids[#ids + 1] = id
      elseif cur then
        local list, found = {}, false
        for t in string.gmatch(cur, '[^,]+') do
          if t == tier then found = true else list[#list + 1] = t end
        end
        if found then redis.call('HSET', key, worker, table.concat(list, ',')) end
      end
    end
  end
  if op == 'a' then
    members('SADD', wset, ids)
    if #ids > 0 and ttl > 0 then redis.call('PEXPIRE', wset, ttl) end
    redis.call('SADD', KEYS[1], worker)
  else
    members('SREM', wset, ids)
    if redis.call('SCARD', wset) == 0 then redis.call('SREM', KEYS[1], worker) end
  end
end
return 0
"""
)

# KEYS: workers set, the worker's key set, block hashes...; ARGV: worker, ids...
CLEAR = Script(
    """
local worker = ARGV[1]
for i = 3, #KEYS do
  redis.call('HDEL', KEYS[i], worker)
  redis.call('SREM', KEYS[2], ARGV[i - 1])
end
if redis.call('SCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[1], worker) end
return 0
"""
)

# KEYS: one key of the shard (it routes the call to the shard's node); ARGV: the block keys'
# prefix, the block keys of the shard in prompt order as comma-joined decimals, the workers to
# consider (none: every holder of the first block). The keys go as one argument and the names
# are built here because a client encodes (and a cluster client hashes) every argument apart:
# 8,192 keys took most of a 128k-token lookup's client CPU. All keys share the tag of KEYS[1],
# so the script stays within its slot. Each worker is dropped at its first block it does not
# hold; the walk ends when none is left. Returns {{worker, count, tiers, count, tiers, ...},
# ...}: each worker's run over these keys, run-length encoded (workers without one are left out).
WALK = Script(
    """
local prefix, runs, active, first = ARGV[1], {}, {}, true
for id in string.gmatch(ARGV[2], '[^,]+') do
  local key = prefix .. id
  if first then
    first = false
    if #ARGV > 2 then
      local names = {unpack(ARGV, 3)}
      local vals = redis.call('HMGET', key, unpack(names))
      for i = 1, #names do
        if vals[i] then
          active[#active + 1] = names[i]
          runs[names[i]] = {1, vals[i]}
        end
      end
    else
      local flat = redis.call('HGETALL', key)
      for i = 1, #flat, 2 do
        active[#active + 1] = flat[i]
        runs[flat[i]] = {1, flat[i + 1]}
      end
    end
  else
    if #active == 0 then break end
    local vals = redis.call('HMGET', key, unpack(active))
    local still = {}
    for i = 1, #active do
      local v = vals[i]
      if v then
        local run = runs[active[i]]
        local n = #run
        if run[n] == v then run[n - 1] = run[n - 1] + 1 else run[n + 1] = 1; run[n + 2] = v end
        still[#still + 1] = active[i]
      end
    end
    active = still
  end
end
local out = {}
for w, run in pairs(runs) do
  local item = {w}
  for j = 1, #run do item[j + 1] = run[j] end
  out[#out + 1] = item
end
return out
"""
)

# KEYS: workers set, then the key set of each worker in ARGV. Drops workers whose set expired.
WORKERS = Script(
    """
local out = {}
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 1 then
    out[#out + 1] = ARGV[i]
  else
    redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return out
"""
)
