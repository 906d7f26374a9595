# Pushes, with the sample app's own client (examples/fleets/sidekiq_app.rb,
# on whichever Sidekiq is on the load path), jobs whose first attempt fails
# (users 4, 9, 14, …: the app's ledger refuses their first delivery):
#   - 5 with Sidekiq's default retry (the worker sets none): retried, then ok;
#     prints "retried <jid>" for each,
#   - 1 with retry: 0 and 1 with retry: false: never retried (dead);
#     prints "dead <jid>" for each.
# Environment: the app's (REDIS_URL, SIDEKIQ_QUEUE, QBD_LEDGER).
require_relative "../../examples/fleets/sidekiq_app"

$stdout.sync = true
5.times { |i| puts "retried #{WelcomeEmail.perform_async(5 * i + 4)}" }
puts "dead #{WelcomeEmail.set(retry: 0).perform_async(29)}"
puts "dead #{WelcomeEmail.set(retry: false).perform_async(34)}"
