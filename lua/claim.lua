-- flashgate claim: an activity's layout and newest version, kept on its base tag {<id>} and
-- checked before any segment is prewarmed. What Redis records here outlives every YAML edit and
-- restart, so a configuration that disagrees with it is refused instead of selling twice.
-- (lib.lua is prepended.)
--
-- KEYS[1] the activity's meta   KEYS[2] and KEYS[3] keys only an older flashgate wrote
-- (<p>:{<id>}:versions, <p>:{<id>}:v<version>:segments)   KEYS[4] and KEYS[5] users and res of
-- the base tag: an unsegmented activity's only segment, which shares the meta's tag
-- KEYS[6] the activity's floor: the newest version ever claimed, the one key that never
-- expires (one small string per activity id ever sold), so that what was on sale is known after
-- every other key expired with the retention
-- KEYS[7] the activity's record of the variants each version was first put on sale with (on
-- its tag {<id>}, shared by its variants' lanes)
-- ARGV[1] configured version   ARGV[2] configured segments (segments)   ARGV[3] expire-at (unix s)
-- ARGV[4] the variant this lane sells ('' for an activity without variants)   ARGV[5] the
-- configured variants, comma-separated (recorded by the first lane to claim a version)
--
-- A variant's lane passes its own records as KEYS[4] and KEYS[5] (users is shared by the
-- activity's variants: another variant's would say nothing of this lane).
--
-- Returns {code, value}:
--   1 claimed: this version is the newest (value: the version)
--  -1 the activity was first sold with another segment count (value: that count)
--  -2 a newer version was already claimed (value: that version): an older YAML
--  -3 the keys were written by an older flashgate's layout
--  -4 this version was claimed before and its keys are gone (expired with the retention after
--     the sale, or removed): it never sells again (value: the version); a new one sells afresh
--  -5 the variant is not one this version was put on sale with (value: the variants it was):
--     a variant added under a version already on sale (a restart with an edited YAML) would
--     put stock on sale the version never had; a new version sells the new set

local meta = redis.call('EXISTS', KEYS[1]) == 1
if not meta and (redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1) then
  return {-3, ''}
end
local floor = redis.call('GET', KEYS[6])
if floor and tonumber(ARGV[1]) < tonumber(floor) then
  return {-2, floor}
end
local segments = redis.call('HGET', KEYS[1], 'segments')
local unsegmented_alive = marked(KEYS[4]) or marked(KEYS[5])
if floor and ARGV[1] == floor and not meta and not unsegmented_alive then
  return {-4, floor}
end
if not segments and unsegmented_alive then
  -- The meta is gone but the activity was sold unsegmented (its one segment is here).
  segments = '1'
end
if segments and segments ~= ARGV[2] then
  return {-1, segments}
end
local newest = redis.call('HGET', KEYS[1], 'version')
if newest and tonumber(ARGV[1]) < tonumber(newest) then
  return {-2, newest}
end
if ARGV[4] ~= '' then
  local set = redis.call('HGET', KEYS[7], ARGV[1])
  if not set then
    redis.call('HSET', KEYS[7], ARGV[1], ARGV[5])
  elseif not string.find(',' .. set .. ',', ',' .. ARGV[4] .. ',', 1, true) then
    return {-5, set}
  end
  extend(KEYS[7], ARGV[3])
end
redis.call('HSET', KEYS[1], 'segments', ARGV[2])
if not newest or tonumber(ARGV[1]) > tonumber(newest) then
  redis.call('HSET', KEYS[1], 'version', ARGV[1])
end
if not floor or tonumber(ARGV[1]) > tonumber(floor) then
  redis.call('SET', KEYS[6], ARGV[1])
end
extend(KEYS[1], ARGV[3])
return {1, ARGV[1]}
