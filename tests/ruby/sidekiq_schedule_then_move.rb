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
#   move-loaded-elsewhere ELSEWHERE_URL SECONDS
#                       -> the same pass by a poller that loaded its script
#                          at ELSEWHERE_URL (Redis itself, or another proxy)
#                          while nothing was due, then, SECONDS later, runs
#                          through REDIS_URL with the script's SHA-1 alone
#                          (EVALSHA, no SCRIPT LOAD there); prints "moved"
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
when "move-loaded-elsewhere"
  enq = Sidekiq::Scheduled::Enq.new
  Sidekiq.configure_client { |c| c.redis = { url: ARGV[1] } }
  enq.enqueue_jobs
  sleep ARGV[2].to_f
  Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("REDIS_URL") } }
  enq.enqueue_jobs
  puts "moved"
else
  abort "usage: schedule N SECONDS | move | move-loaded-elsewhere ELSEWHERE_URL SECONDS"
end
