# frozen_string_literal: true

# Every test of the adapter. From adapters/ruby (README, "Tests"):
#   QBRIDGE_TEST_DATABASE_URL=postgres://… QBRIDGE_TEST_REDIS_URL=redis://… \
#     ruby -Ilib -Itest test/all.rb
# The Rust suite runs it under Sidekiq 6.4 and 7.3 (tests/it/fleet_adapters.rs).
Dir[File.join(__dir__, "*_test.rb")].sort.each { |f| require f }
