# A Sidekiq 6.4 fleet with gitlab-sidekiq-fetcher's reliable fetch (Debian's
# ruby-gitlab-sidekiq-fetcher): a worker moves each job it takes from
# queue:<name> into its private list working:queue:<name>:<identity>
# (RPOPLPUSH) and removes it from there when the job is done.
#   ruby sidekiq_reliable_fetch.rb produce N     N perform_async; prints jids
#   sidekiq -r ./sidekiq_reliable_fetch.rb -q default -c 1
#                                                 the worker; each job sleeps
#                                                 QBT_SLEEP seconds
# Environment: REDIS_URL.
require "sidekiq"
require "sidekiq-reliable-fetch"

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("REDIS_URL") } }
Sidekiq.configure_server do |c|
  c.redis = { url: ENV.fetch("REDIS_URL") }
  Sidekiq::ReliableFetch.setup_reliable_fetch!(c)
end
Sidekiq.logger.level = Logger::WARN

class Slow
  include Sidekiq::Worker

  def perform(_n)
    sleep ENV.fetch("QBT_SLEEP", "30").to_f
  end
end

if $PROGRAM_NAME == __FILE__
  $stdout.sync = true
  abort "usage: produce N" unless ARGV[0] == "produce"
  ARGV[1].to_i.times { |i| puts Slow.perform_async(i) }
end
