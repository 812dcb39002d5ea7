#include "dplb/ledger/ledger_functions.hpp"

namespace dplb::ledger {

// Redis runs one function at a time, so each of these reads the ledger and writes it in one atomic step:
// two replicas' picks can never both see a rank idle and both take it. The keys of one ledger share the
// hash tag `{dplb:<ns>}`, so that a Redis Cluster keeps them in one slot; a function reaches other replicas'
// hashes (when it expires them) by name under that same tag.
//
// KEYS (every function): 1 `{..}:replicas` (ZSET: replica -> its lease's expiry, Redis server time in ms),
// 2 `{..}:total` (HASH: rank -> requests in flight over all live replicas), 3 `{..}:rr` (with a group's
// number appended, that group's shared rotation cursor: the rank a tie starts from), 4 `{..}:r:<replica>`
// (HASH: rank -> the caller's requests in flight).
// ARGV starts with the caller's name and its lease in ms; every call expires dead replicas (their counts
// leave the total) and renews the caller's lease.
const std::string_view ledger_function_library = R"lua(#!lua name=dplb_ledger_3

-- How long a ledger's keys outlive the last registration.
local abandoned_after_ms = 600000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- '{dplb:ns}' from '{dplb:ns}:replicas'.
local function prefix_of(keys)
  return string.sub(keys[1], 1, -(#':replicas' + 1))
end

-- Takes n off a rank's total; a field at 0 (or below: never trusted) is removed.
local function subtract(total_key, rank, n)
  if n <= 0 then return end
  if redis.call('HINCRBY', total_key, rank, -n) <= 0 then redis.call('HDEL', total_key, rank) end
end

-- Replicas whose lease ran out leave: their counts come off the total, their hash goes. Then the caller's
-- lease is renewed (a caller that had expired comes back with no counts until it registers again).
local function expire_and_renew(keys, replica, lease_ms)
  local now = now_ms()
  local dead = redis.call('ZRANGE', keys[1], '-inf', '(' .. now, 'BYSCORE')
  if #dead > 0 then
    local prefix = prefix_of(keys)
    for _, name in ipairs(dead) do
      local held_key = prefix .. ':r:' .. name
      local held = redis.call('HGETALL', held_key)
      for i = 1, #held, 2 do subtract(keys[2], held[i], tonumber(held[i + 1])) end
      redis.call('DEL', held_key)
      redis.call('ZREM', keys[1], name)
    end
  end
  redis.call('ZADD', keys[1], now + lease_ms, replica)
end

-- Among the ranks for which `tied(i)` holds, the first at or after the cursor, wrapping; the cursor
-- then moves past it. Ranks are compared by number, so replicas that see different candidates still
-- share one rotation. Each group of ranks (a cluster, a pool) has its cursor, `{..}:rr` followed by the
-- group's number: one cluster's picks never move another's turn. A pick with one candidate (a pinned
-- request) has no turn to take and moves nothing.
local rotation_key
local function in_rotation(keys, ranks, tied)
  if #ranks == 1 then
    if tied(1) then return 1 end
    return nil
  end
  local cursor = tonumber(redis.call('GET', rotation_key) or 0)
  local best, best_distance = nil, nil
  for i = 1, #ranks do
    if tied(i) then
      local distance = ranks[i] - cursor
      if distance < 0 then distance = distance + 4294967296 end
      if best == nil or distance < best_distance then best, best_distance = i, distance end
    end
  end
  -- (It outlives the last pick as long as the ledger's other keys outlive the last registration.)
  if best ~= nil then redis.call('SET', rotation_key, ranks[best] + 1, 'PX', abandoned_after_ms) end
  return best
end

-- Besides its requests (field '<rank>'), a replica's hash and the total hold the tokens of those requests:
-- '<rank>:p', the prompt tokens not yet prefilled, and '<rank>:c', the tokens the rank still owes them (those
-- prompt tokens and max_tokens), as the balancer counts a rank's cost: both lose the prompt at its first
-- byte. Expiry, registration and the view treat every field alike.
local function field(rank, part) return rank .. ':' .. part end

-- Takes up to n of a field back from the caller's hash and the total (never more than the caller holds).
local function take_back(keys, name, n)
  local held = tonumber(redis.call('HGET', keys[4], name) or 0)
  if n > held then n = held end
  if n <= 0 then return 0 end
  if n == held then redis.call('HDEL', keys[4], name) else redis.call('HINCRBY', keys[4], name, -n) end
  subtract(keys[2], name, n)
  return n
end

-- least-tokens, as the balancer's least_tokens policy decides (its constants come in as arguments): among
-- the candidates within `band` requests (per weight) of the fewest, those within one slot of the least work
-- ((prompt + share * decode + slot * requests) / weight); of them the fewest requests per weight; a tie of
-- those goes to the rotation.
local function least_tokens(keys, ranks, weights, counts, open, band, slot, share)
  local work = {}
  for i = 1, #ranks do
    local prompt = tonumber(redis.call('HGET', keys[2], field(ranks[i], 'p')) or 0)
    local cost = tonumber(redis.call('HGET', keys[2], field(ranks[i], 'c')) or 0)
    local decode = cost - math.min(prompt, cost)
    work[i] = (prompt + share * decode + slot * counts[i]) / weights[i]
  end
  local fewest
  for i = 1, #ranks do
    if open(i) and (fewest == nil or counts[i] / weights[i] < fewest) then fewest = counts[i] / weights[i] end
  end
  if fewest == nil then return nil end
  local function in_band(i) return open(i) and counts[i] / weights[i] - fewest <= band / weights[i] end
  local least
  for i = 1, #ranks do
    if in_band(i) and (least == nil or work[i] < least) then least = work[i] end
  end
  local function near(i) return in_band(i) and work[i] - least <= slot / weights[i] end
  local lowest
  for i = 1, #ranks do
    if near(i) and (lowest == nil or counts[i] / weights[i] < lowest) then lowest = counts[i] / weights[i] end
  end
  return in_rotation(keys, ranks, function(i) return near(i) and counts[i] / weights[i] == lowest end)
end

-- ARGV: replica, lease ms, policy ('least-inflight', 'round-robin', 'least-tokens' or 'least-load'),
-- per-rank limit (0: none), the request's prompt and decode tokens, least-tokens' band, slot tokens and
-- decode share, the group of ranks whose rotation it takes a turn of, then rank, weight, floor for each
-- candidate (least-load weighs max(requests, floor): what the
-- rank's engine reports raises its load, never lowers it below every replica's requests). Records the pick
-- (the request and its tokens) and returns {rank or -1, live replicas, the candidates' global counts before
-- the pick, in the order given}.
local function pick(keys, args)
  expire_and_renew(keys, args[1], tonumber(args[2]))
  local policy, limit = args[3], tonumber(args[4])
  local prompt, decode = tonumber(args[5]), tonumber(args[6])
  rotation_key = keys[3] .. ':' .. args[10]
  local ranks, weights, floors, counts = {}, {}, {}, {}
  for i = 11, #args - 2, 3 do
    local n = #ranks + 1
    ranks[n] = tonumber(args[i])
    weights[n] = tonumber(args[i + 1])
    floors[n] = tonumber(args[i + 2])
    counts[n] = tonumber(redis.call('HGET', keys[2], args[i]) or 0)
  end
  local function open(i) return limit == 0 or counts[i] < limit end
  local chosen
  if policy == 'least-tokens' then
    chosen = least_tokens(keys, ranks, weights, counts, open, tonumber(args[7]), tonumber(args[8]), tonumber(args[9]))
  elseif policy == 'round-robin' then
    chosen = in_rotation(keys, ranks, open)
  elseif policy == 'least-load' then
    local function load(i) return math.max(counts[i], floors[i]) / weights[i] end
    local lowest
    for i = 1, #ranks do
      if open(i) and (lowest == nil or load(i) < lowest) then lowest = load(i) end
    end
    chosen = in_rotation(keys, ranks, function(i) return open(i) and load(i) == lowest end)
  elseif policy == 'least-inflight' then
    local lowest
    for i = 1, #ranks do
      if open(i) and (lowest == nil or counts[i] / weights[i] < lowest) then lowest = counts[i] / weights[i] end
    end
    chosen = in_rotation(keys, ranks, function(i) return open(i) and counts[i] / weights[i] == lowest end)
  else
    return redis.error_reply('dplb_pick_3: unknown policy ' .. tostring(policy))
  end
  local reply = {-1, redis.call('ZCARD', keys[1])}
  if chosen ~= nil then
    redis.call('HINCRBY', keys[4], ranks[chosen], 1)
    redis.call('HINCRBY', keys[2], ranks[chosen], 1)
    for part, n in pairs({p = prompt, c = prompt + decode}) do
      if n > 0 then
        redis.call('HINCRBY', keys[4], field(ranks[chosen], part), n)
        redis.call('HINCRBY', keys[2], field(ranks[chosen], part), n)
      end
    end
    reply[1] = ranks[chosen]
  end
  for i = 1, #counts do reply[i + 2] = counts[i] end
  return reply
end

-- ARGV: replica, lease ms, rank, the request's prompt tokens still in flight, its cost still owed. Gives back one of
-- the caller's requests on the rank and its tokens, if it holds one there (a release after its lease
-- expired changes nothing), and announces the freed slot on `{..}:freed`. Returns 1 if a slot was freed.
local function release(keys, args)
  expire_and_renew(keys, args[1], tonumber(args[2]))
  local rank = args[3]
  if take_back(keys, rank, 1) == 0 then return 0 end
  take_back(keys, field(rank, 'p'), tonumber(args[4] or 0))
  take_back(keys, field(rank, 'c'), tonumber(args[5] or 0))
  redis.call('PUBLISH', prefix_of(keys) .. ':freed', rank)
  return 1
end

-- ARGV: replica, lease ms, rank, prompt tokens. A request's prompt is prefilled (its first byte came): its
-- prompt tokens leave the rank's prompt load and its cost; its decode tokens stay until the release.
local function prompt_done(keys, args)
  expire_and_renew(keys, args[1], tonumber(args[2]))
  local n = take_back(keys, field(args[3], 'p'), tonumber(args[4]))
  take_back(keys, field(args[3], 'c'), n)
  return n
end

-- ARGV: replica, lease ms, then rank, count for each rank the caller has requests in flight on. The
-- caller's hash becomes exactly that (the total follows the differences): how a server restarted empty
-- gets every replica's requests back, and how a replica restarted under the same name replaces its
-- previous incarnation's counts. Returns the live replicas.
local function register(keys, args)
  expire_and_renew(keys, args[1], tonumber(args[2]))
  local want = {}
  for i = 3, #args - 1, 2 do
    local n = tonumber(args[i + 1])
    if n > 0 then want[args[i]] = n end
  end
  local held = redis.call('HGETALL', keys[4])
  local had = {}
  for i = 1, #held, 2 do had[held[i]] = tonumber(held[i + 1]) end
  for rank, n in pairs(had) do
    local delta = (want[rank] or 0) - n
    if delta < 0 then subtract(keys[2], rank, -delta) end
  end
  for rank, n in pairs(want) do
    local delta = n - (had[rank] or 0)
    if delta > 0 then redis.call('HINCRBY', keys[2], rank, delta) end
  end
  redis.call('DEL', keys[4])
  for rank, n in pairs(want) do redis.call('HSET', keys[4], rank, n) end
  -- A ledger nobody registers with any more (every replica gone, or a new backend list: a new ns) does
  -- not stay in Redis for ever; live replicas push this back every second.
  for i = 1, 4 do redis.call('PEXPIRE', keys[i], abandoned_after_ms) end
  return redis.call('ZCARD', keys[1])
end

-- ARGV: replica, lease ms. The ledger as the replicas share it: {live replicas, rank, count, ...} of the
-- total (for the admin page and the tests).
local function view(keys, args)
  expire_and_renew(keys, args[1], tonumber(args[2]))
  local reply = {redis.call('ZCARD', keys[1])}
  local total = redis.call('HGETALL', keys[2])
  for i = 1, #total do reply[i + 1] = total[i] end
  return reply
end

-- Rate limits all replicas share (a tenant's requests_per_second and tokens_per_minute): token buckets, one
-- per key, each a HASH {tokens, at} (Redis server time in ms), full when absent. ARGV: op, then for each key
-- its rate (units a second), burst and units. 'take': takes every bucket's units if every bucket holds them,
-- else none (a refused request takes nothing from any limit); returns {1, 0, 0}, or {0, the 1-based index of
-- the first bucket that refused, the ms until its units are there (-1: never, more than its burst)}.
-- 'give': units a reservation did not use, back (never above the burst). 'charge': units used beyond a
-- reservation, taken regardless, down to one burst in debt. A key expires once its bucket would be full
-- again, which is what its absence means.
local function bucket(keys, args)
  local op = args[1]
  if op ~= 'take' and op ~= 'give' and op ~= 'charge' then
    return redis.error_reply('dplb_bucket_3: unknown op ' .. tostring(op))
  end
  local now = now_ms()
  local level = {}
  for i = 1, #keys do
    local rate, burst, units = tonumber(args[3 * i - 1]), tonumber(args[3 * i]), tonumber(args[3 * i + 1])
    local state = redis.call('HMGET', keys[i], 'tokens', 'at')
    local tokens = burst
    if state[1] then
      tokens = math.min(burst, tonumber(state[1]) + (now - tonumber(state[2])) * rate / 1000)
    end
    if op == 'take' then
      if units > burst then return {0, i, -1} end
      if tokens < units then return {0, i, math.ceil((units - tokens) * 1000 / rate)} end
      tokens = tokens - units
    elseif op == 'give' then
      tokens = math.min(burst, tokens + units)
    else
      tokens = math.max(-burst, tokens - units)
    end
    level[i] = {tokens, rate, burst}
  end
  for i = 1, #keys do
    local tokens, rate, burst = level[i][1], level[i][2], level[i][3]
    if tokens >= burst then
      redis.call('DEL', keys[i])
    else
      redis.call('HSET', keys[i], 'tokens', tostring(tokens), 'at', tostring(now))
      redis.call('PEXPIRE', keys[i], math.ceil((burst - tokens) * 1000 / rate) + 1000)
    end
  end
  return {1, 0, 0}
end

redis.register_function('dplb_pick_3', pick)
redis.register_function('dplb_release_3', release)
redis.register_function('dplb_prompt_done_3', prompt_done)
redis.register_function('dplb_register_3', register)
redis.register_function('dplb_view_3', view)
redis.register_function('dplb_bucket_3', bucket)
)lua";

}  // namespace dplb::ledger
