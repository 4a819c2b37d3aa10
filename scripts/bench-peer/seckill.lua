-- scripts/bench's OpenResty peer: the flash-sale gateway a shop would write instead of flashgate
-- (nginx + ngx_lua, Debian's libnginx-mod-http-lua), doing the seed article's job on
-- POST /api/seckill/{activity}/buy (buyer in X-User-Id, quantity in ?qty=, default 1):
--
--   1. answered from this node's memory (lua_shared_dict, shared by the workers): the activity is
--      known sold out (410), or the buyer already holds the per-user limit (409);
--   2. otherwise one EVALSHA of the seed script (seed.lua) over a keep-alive cosocket;
--   3. a win adds an HMAC-SHA256-signed grant header and goes on to proxy_pass; -2 answers
--      sold_out (and marks the activity sold out), -3 limit_exceeded (and remembers the buyer).
--
-- The answers carry flashgate's JSON bodies. lua-resty-redis and lua-resty-string are not
-- packaged in Debian 12: a minimal RESP client is below, and HMAC-SHA256 calls the OpenSSL that
-- nginx is linked with through the FFI (as lua-resty-string itself does).
local ffi = require "ffi"
local C = ffi.C
local ngx = ngx
local byte, sub, format, concat = string.byte, string.sub, string.format, table.concat
local tonumber, tostring, floor = tonumber, tostring, math.floor

ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
unsigned char *HMAC(const EVP_MD *evp_md, const char *key, int key_len,
                    const char *d, size_t n, unsigned char *md, unsigned int *md_len);
]]

local M = {}

local cfg = {
  redis_host = "127.0.0.1",
  redis_port = 6379,
  timeout_ms = 1000,
  pool_size = 128,         -- keep-alive Redis connections per worker
  secret = "bench-secret", -- grant signing key
  per_user_limit = 1,
  max_per_request = 1,
  sold_out_ttl = 600,      -- seconds, as flashgate's sold_out_cache.ttl_ms 600000
  script_path = nil,       -- seed.lua
}
local script, sha
local sold_out = ngx.shared.seckill_sold_out
local bought = ngx.shared.seckill_bought
local md = ffi.new("unsigned char[32]")
local md_len = ffi.new("unsigned int[1]")

local SOLD_OUT = '{"code":"sold_out","message":"sold out"}'
local LIMIT = '{"code":"limit_exceeded","message":"this would take you over the per-buyer limit"}'
local UNAUTHENTICATED = '{"code":"unauthenticated","message":"sign in to take part in the sale"}'
local NOT_INTEGER = '{"code":"bad_request","message":"quantity must be a whole number"}'
local TOO_SMALL = '{"code":"bad_request","message":"quantity must be at least 1"}'
local TOO_LARGE = '{"code":"bad_request","message":"quantity exceeds the most one request may buy"}'
local UNKNOWN = '{"code":"unknown_activity","message":"no such sale"}'
local UNAVAILABLE = '{"code":"unavailable","message":"the sale is busy, please retry shortly"}'

local function hex(s)
  return (s:gsub(".", function(c) return format("%02x", byte(c)) end))
end

-- Called from init_by_lua (in the master, before the workers fork).
function M.configure(opts)
  for k, v in pairs(opts) do cfg[k] = v end
  local f = assert(io.open(cfg.script_path, "rb"))
  script = f:read("*a")
  f:close()
  sha = hex(ngx.sha1_bin(script))
end

local function hmac_sha256_b64(msg)
  C.HMAC(C.EVP_sha256(), cfg.secret, #cfg.secret, msg, #msg, md, md_len)
  return ngx.encode_base64(ffi.string(md, md_len[0]))
end

-- RESP: a reply is (value) or (nil, message, true) for a Redis error or (nil, message) for a
-- broken connection.
local function read_reply(sock)
  local line, err = sock:receive()
  if not line then return nil, err end
  local kind = byte(line)
  if kind == 58 then -- ':' integer
    return tonumber(sub(line, 2))
  elseif kind == 45 then -- '-' error
    return nil, sub(line, 2), true
  elseif kind == 43 then -- '+' status
    return sub(line, 2)
  elseif kind == 36 then -- '$' bulk string
    local len = tonumber(sub(line, 2))
    if len < 0 then return ngx.null end
    local data, err2 = sock:receive(len + 2)
    if not data then return nil, err2 end
    return sub(data, 1, len)
  end
  return nil, "unexpected reply: " .. line
end

local function command(sock, args)
  local req = { "*", #args, "\r\n" }
  for i = 1, #args do
    local a = tostring(args[i])
    req[#req + 1] = "$" .. #a .. "\r\n"
    req[#req + 1] = a
    req[#req + 1] = "\r\n"
  end
  local ok, err = sock:send(req)
  if not ok then return nil, err end
  return read_reply(sock)
end

-- One seed-script call: its integer result, or nil and why.
local function seed(act, user, qty)
  local sock = ngx.socket.tcp()
  sock:settimeout(cfg.timeout_ms)
  local ok, err = sock:connect(cfg.redis_host, cfg.redis_port)
  if not ok then return nil, err end
  local args = { "EVALSHA", sha, 2, "seckill:stock:{" .. act .. "}:v1", "seckill:users:{" .. act .. "}",
    user, qty, cfg.per_user_limit }
  local res, why, redis_error = command(sock, args)
  if redis_error and sub(why, 1, 8) == "NOSCRIPT" then
    args[1], args[2] = "EVAL", script
    res, why, redis_error = command(sock, args)
  end
  if res == nil and not redis_error then
    sock:close()
    return nil, why
  end
  sock:setkeepalive(60000, cfg.pool_size)
  if res == nil then return nil, why end
  return res
end

local function answer(status, body, retry_after)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #body
  ngx.header["Cache-Control"] = "no-store"
  if retry_after then ngx.header["Retry-After"] = retry_after end
  ngx.print(body)
  return ngx.exit(ngx.HTTP_OK)
end

-- access_by_lua on the sale location ($act is the activity). Returning lets proxy_pass forward.
function M.buy()
  if ngx.req.get_method() ~= "POST" then
    ngx.req.clear_header("X-Seckill-Grant") -- only this gateway makes grants
    return
  end
  local act = ngx.var.act
  local user = ngx.var.http_x_user_id
  if not user or user == "" then return answer(401, UNAUTHENTICATED) end
  local qty = 1
  local raw = ngx.var.arg_qty
  if raw then
    qty = tonumber(raw)
    if not qty or qty ~= floor(qty) then return answer(400, NOT_INTEGER) end
    if qty < 1 then return answer(400, TOO_SMALL) end
    if qty > cfg.max_per_request then return answer(400, TOO_LARGE) end
  end
  if sold_out:get(act) then return answer(410, SOLD_OUT) end
  local key = act .. ":" .. user
  if (bought:get(key) or 0) + qty > cfg.per_user_limit then return answer(409, LIMIT) end

  local left, err = seed(act, user, qty)
  if not left then
    ngx.log(ngx.ERR, "seed script: ", err)
    return answer(503, UNAVAILABLE, 1)
  end
  if left == -3 then
    bought:set(key, cfg.per_user_limit)
    return answer(409, LIMIT)
  elseif left == -2 then
    if qty == 1 then sold_out:set(act, true, cfg.sold_out_ttl) end
    return answer(410, SOLD_OUT)
  elseif left < 0 then
    return answer(404, UNKNOWN)
  end
  bought:incr(key, qty, 0)
  if left == 0 then sold_out:set(act, true, cfg.sold_out_ttl) end
  local grant = concat({ act, user, qty, ngx.time() }, ":")
  ngx.req.set_header("X-Seckill-Grant", grant .. ":" .. hmac_sha256_b64(grant))
end

return M
