-- Raise a name's fence without granting anything (an operator freed it).
-- KEYS[1] fence key
-- ARGV[1] how long the fence key is kept, in ms
-- Returns the new fence: above every fence granted so far (see next_fence).
-- include: _lib
return next_fence({fence = KEYS[1], keep = ARGV[1]})
