-- Argo CD health check for backpressure.dev/WorkerBackpressure (resource.customizations key
-- "backpressure.dev/WorkerBackpressure", field health.lua). Argo CD runs it with gopher-lua
-- (Lua 5.1) and the object as the global `obj`. It reads the same conditions kstatus does:
--
--   Progressing  status missing, or metadata.generation not yet observed by the operator;
--                Ramping=True (a staged ramp is running); Reconciling=True; Ready missing or
--                Unknown; Ready=False with a progressing reason (see below)
--   Degraded     Stalled=True; GuardApplied=False (Guard mode cannot clamp the guarded
--                autoscaler); Ready=False with any other reason
--   Suspended    spec.suspend is true and observed
--   Healthy      Ready=True for the current generation
--
-- A held scale-out (regime DependencyFailing) is Healthy: the operator is doing its job; the
-- message says what it holds and why.

local hs = {}

local progressingReasons = {
  Progressing = true,
  Reconciling = true,
  Ramping = true,
  Pending = true,
  Initializing = true,
}

local function condition(conditions, conditionType)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function describe(c)
  local text = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local function summary(status)
  local parts = {}
  if status.regime ~= nil then
    table.insert(parts, "regime " .. status.regime)
  end
  local r = status.replicas
  if r ~= nil and r.current ~= nil then
    local text = "replicas " .. tostring(r.current)
    if r.desired ~= nil then
      text = text .. "/" .. tostring(r.desired)
    end
    if r.recommended ~= nil then
      text = text .. " (recommended " .. tostring(r.recommended) .. ")"
    end
    table.insert(parts, text)
  end
  return table.concat(parts, ", ")
end

local status = obj.status
local generation = obj.metadata and obj.metadata.generation

if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile"
  return hs
end

if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true: the operator neither decides nor acts"
  return hs
end

local conditions = status.conditions
local stalled = condition(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end

local guard = condition(conditions, "GuardApplied")
if guard ~= nil and guard.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(guard)
  return hs
end

local ramping = condition(conditions, "Ramping")
if ramping ~= nil and ramping.status == "True" then
  hs.status = "Progressing"
  local text = describe(ramping)
  local ramp = status.ramp
  if ramp ~= nil and ramp.stage ~= nil and ramp.of ~= nil then
    text = "Ramp stage " .. tostring(ramp.stage) .. " of " .. tostring(ramp.of) ..
      " toward " .. tostring(ramp.to) .. " replicas (" .. text .. ")"
  end
  hs.message = text
  return hs
end

local reconciling = condition(conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling)
  return hs
end

local ready = condition(conditions, "Ready")
if ready == nil or ready.status == "Unknown" then
  hs.status = "Progressing"
  hs.message = "Waiting for condition Ready"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  local text = summary(status)
  if ready.message ~= nil and ready.message ~= "" then
    if text ~= "" then
      text = text .. ": "
    end
    text = text .. ready.message
  end
  hs.message = text
  return hs
end

if ready.reason ~= nil and progressingReasons[ready.reason] then
  hs.status = "Progressing"
else
  hs.status = "Degraded"
end
hs.message = describe(ready)
return hs
