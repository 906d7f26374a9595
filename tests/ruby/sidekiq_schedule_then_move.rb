# Two steps of a Sidekiq 6.4 fleet (Debian's ruby-sidekiq) through qbridge's
# proxy at REDIS_URL, run as separate processes so a test can flip the route
# between them:
#   schedule N SECONDS  -> N jobs of queue "default" due in SECONDS
#                          (perform_in: ZADD schedule); prints their jids
#   move                -> one pass of Sidekiq's own scheduler
#                          (Sidekiq::Scheduled::Enq, what a Sidekiq server's
#                          poller runs): it pops each due job from
#                          `schedule` with its Lua script and pushes it to
#                          queue:default; prints "moved"
require "sidekiq"
require "sidekiq/scheduled"

# The sample app (examples/fleets/sidekiq_app.rb) on queue "default": its
# client and its worker class, WelcomeEmail.
ENV["SIDEKIQ_QUEUE"] = "default"
require_relative "../../examples/fleets/sidekiq_app"

case ARGV[0]
when "schedule"
  ARGV[1].to_i.times { |i| puts WelcomeEmail.perform_in(ARGV[2].to_f, i) }
when "move"
  Sidekiq::Scheduled::Enq.new.enqueue_jobs
  puts "moved"
else
  abort "usage: schedule N SECONDS | move"
end
