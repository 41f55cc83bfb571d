-- mererun prefix affinity for HAProxy (Lua 5.3, HAProxy >= 2.6).
--
-- Registers the sample fetch `lua.mererun_affinity`: the key a request is hashed on, so that
-- every turn of a conversation reaches the replica whose prefix cache holds its earlier turns.
--   1. Claude Code sends X-Claude-Code-Session-Id on every request of a session: "s:" .. id.
--   2. Otherwise the leading part of the prompt, which every later turn of the conversation
--      repeats byte for byte: the raw JSON of "system", "tools" and "messages" up to and
--      including the first user message (Anthropic: messages[0]; OpenAI: the system message
--      and the first user message). "p:" .. those bytes; HAProxy hashes them.
-- The body is what `option http-buffer-request` buffered (up to tune.bufsize): a request larger
-- than that is keyed on the part of those fields that arrived, which is the same bytes on every
-- turn. A body that is not a JSON object gives "" (one fixed replica, the server answers 400).
-- Nothing here trusts the body: a scan that runs out of bytes simply stops.

local function skip_ws(s, i)
  return s:find("[^ \t\r\n]", i)
end

-- s:sub(i, i) is '"': the index after the closing quote, or nil when the body ends first.
local function skip_string(s, i)
  local j = i + 1
  while true do
    local k = s:find('["\\]', j)
    if not k then return nil end
    if s:byte(k) == 92 then j = k + 2 else return k + 1 end
  end
end

-- The index after the JSON value starting at i, or nil when the body ends first.
local function skip_value(s, i)
  local c = s:sub(i, i)
  if c == '"' then return skip_string(s, i) end
  if c == "{" or c == "[" then
    local depth, j = 0, i
    while true do
      local k = s:find('[%[%]{}"]', j)
      if not k then return nil end
      local ch = s:sub(k, k)
      if ch == '"' then
        j = skip_string(s, k)
        if not j then return nil end
      else
        depth = depth + ((ch == "{" or ch == "[") and 1 or -1)
        j = k + 1
        if depth == 0 then return j end
      end
    end
  end
  return s:find("[,}%]]", i)  -- a number, true, false or null
end

-- The messages array at i ('['): its elements up to and including the first user message (at
-- most 4), as raw bytes; a truncated element contributes what arrived.
local function leading_messages(s, i)
  local out, j = {}, i + 1
  for _ = 1, 4 do
    j = skip_ws(s, j)
    if not j then break end
    if s:sub(j, j) == "," then j = skip_ws(s, j + 1) end
    if not j or s:sub(j, j) ~= "{" then break end
    local e = skip_value(s, j)
    local elem = s:sub(j, (e or #s + 1) - 1)
    out[#out + 1] = elem
    -- A nested "role" is escaped inside strings (\"role\"), so this only sees object keys.
    if not e or elem:find('"role"%s*:%s*"user"') then break end
    j = e
  end
  return table.concat(out, "\30")
end

local function leading_part(s)
  local i = skip_ws(s, 1)
  if not i or s:sub(i, i) ~= "{" then return "" end
  local parts = {}
  i = i + 1
  for _ = 1, 64 do  -- top-level keys; requests have a few dozen at most
    i = skip_ws(s, i)
    if not i then break end
    if s:sub(i, i) == "," then i = skip_ws(s, i + 1) end
    if not i or s:sub(i, i) ~= '"' then break end
    local kend = skip_string(s, i)
    if not kend then break end
    local key = s:sub(i + 1, kend - 2)
    i = skip_ws(s, kend)
    if not i or s:sub(i, i) ~= ":" then break end
    i = skip_ws(s, i + 1)
    if not i then break end
    local vend = skip_value(s, i)
    if key == "messages" and s:sub(i, i) == "[" then
      parts.messages = leading_messages(s, i)
    elseif key == "system" or key == "tools" then
      parts[key] = s:sub(i, (vend or #s + 1) - 1)
    end
    if not vend then break end
    i = vend
  end
  if not (parts.system or parts.tools or parts.messages) then return "" end
  return "p:" .. (parts.system or "") .. "\31" .. (parts.tools or "") .. "\31" .. (parts.messages or "")
end

core.register_fetches("mererun_affinity", function(txn)
  local sid = txn.sf:req_fhdr("x-claude-code-session-id")
  if sid and sid ~= "" then return "s:" .. sid end
  local body = txn.sf:req_body()
  if not body or body == "" then return "" end
  return leading_part(body)
end)
