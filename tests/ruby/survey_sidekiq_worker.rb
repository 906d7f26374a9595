# The jobs a real Sidekiq 6.4 worker runs in `qbridge survey`'s tests
# (`sidekiq -r` loads this file): Boom fails, so Sidekiq's retry moves it
# to the retry set; Slow runs long enough to be in flight when the survey
# reads the process's busy threads.
require "sidekiq"

class Boom
  include Sidekiq::Worker
  def perform(*)
    raise "boom"
  end
end

class Slow
  include Sidekiq::Worker
  def perform(*)
    sleep 600
  end
end
