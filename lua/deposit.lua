-- flashgate deposit: the second half of a transfer on its own (a sweep delivering one a gateway
-- left half done; a buyer's rebalance deposits with its reserve). (lib.lua is prepended.)
--
-- KEYS[1] stock of the transfer's version (receiving segment)   KEYS[2] its ledger
-- KEYS[3] transfers the segment received
-- ARGV[1] transfer id   ARGV[2] units
--
-- Returns 1 deposited, 0 already deposited, -1 no ledger of that version here.

return deposit({stock = KEYS[1], ledger = KEYS[2], received = KEYS[3]}, ARGV[1], ARGV[2])
