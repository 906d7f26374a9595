# frozen_string_literal: true

# The Postgres side's runner for Sidekiq jobs: qbridge's http handler (or
# command handler) for a route of format "sidekiq", running the team's own
# worker classes. See bin/qbridge-sidekiq-runner.
#
# Answers (the http handler's contract): 200 with the canonical JSON of
# perform's return value; 204 in shadow when the class says "skip"; 503
# when Sidekiq would retry the failure (retry option and qbridge's attempt
# number); 422 when it is final (or the class is unknown, or it refuses
# shadow calls). Error bodies name an exception's class, never its message
# (it may quote the payload); nothing here logs a payload.
require "json"
require "socket"
require "sidekiq"
require_relative "reporter"
require_relative "sidekiq"

module Qbridge
  module Sidekiq
    module Runner
      # One job: [status, body]. Never raises.
      def self.run(body, mode, attempt)
        job = JSON.parse(body)
        return [422, "the job's payload is not a Sidekiq job"] unless job.is_a?(Hash) && job["class"]

        klass = begin
          Object.const_get(job["class"])
        rescue NameError
          return [422, "unknown worker class #{job['class']}"]
        end
        worker = klass.new
        worker.jid = job["jid"] if worker.respond_to?(:jid=)
        args = job["args"] || []
        return shadow(klass, worker, job, args) if mode == "shadow"
        return [400, "Qbridge-Mode must be live or shadow"] unless mode == "live"

        perform(klass, worker, job, args, attempt)
      rescue JSON::ParserError
        [422, "the job's payload is not JSON"]
      rescue StandardError, ScriptError => e
        [503, e.class.name]
      end

      # The job's Sidekiq options as Sidekiq's client merged them: the
      # class's, then those of the class a wrapper job names (`wrapped`: an
      # ActiveJob class with sidekiq_options), then the job's own.
      def self.options(klass, job)
        options = klass.respond_to?(:get_sidekiq_options) ? klass.get_sidekiq_options.dup : {}
        wrapped = job["wrapped"] && (Object.const_get(job["wrapped"]) rescue nil) # rubocop:disable Style/RescueModifier
        options.merge!(wrapped.get_sidekiq_options) if wrapped.respond_to?(:get_sidekiq_options)
        options
      end

      def self.shadow(klass, worker, job, args)
        behaviour = (options(klass, job)["qbridge_shadow"] || "refuse").to_s
        case behaviour
        when "skip" then [204, ""]
        when "dry_run"
          return [422, "#{klass} declares a dry run but has no perform_shadow"] unless worker.respond_to?(:perform_shadow)

          done(worker.perform_shadow(*args))
        else [422, "#{klass} refuses shadow calls (sidekiq_options qbridge_shadow)"]
        end
      end

      def self.perform(klass, worker, job, args, attempt)
        done(worker.perform(*args))
      rescue StandardError, ScriptError => e
        # Failures before this attempt, as Sidekiq's retry_count would say.
        seen = job.merge("retry_count" => attempt > 1 ? attempt - 2 : nil)
        # qbridge does not say when the first attempt failed: retry_for counts
        # from the job's failed_at when the fleet had failed it already, else
        # it never ends a job here and the route's max_attempts bounds it.
        [Sidekiq.final_failure?(seen, klass, error: e) ? 422 : 503, e.class.name]
      end

      # A finished job's answer: its canonical result, or 204 when it cannot
      # be written as JSON (nothing to compare, as on the fleet's side).
      def self.done(result)
        text = Qbridge.canonical(result)
        text.nil? ? [204, ""] : [200, text]
      end

      REASONS = { 200 => "OK", 204 => "No Content", 400 => "Bad Request", 422 => "Unprocessable Entity",
                  503 => "Service Unavailable" }.freeze

      # Serves qbridge's POSTs on host:port, one thread per connection.
      def self.serve(host, port, out: $stdout)
        server = TCPServer.new(host, port)
        out.puts("qbridge runner (sidekiq) listening on #{host}:#{port}")
        out.flush
        loop do
          client = server.accept
          Thread.new(client) { |c| connection(c) }
        end
      end

      def self.connection(client)
        while (request = read_request(client))
          headers, body = request
          if body.nil?
            # No Content-Length (a chunked body): answer, and close, rather
            # than read its bytes as the next request.
            client.write("HTTP/1.1 411 Length Required\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            break
          end
          status, text = run(body, (headers["qbridge-mode"] || "live").downcase, (headers["qbridge-attempt"] || 1).to_i)
          data = status == 204 ? "" : text
          head = +"HTTP/1.1 #{status} #{REASONS.fetch(status, 'Error')}\r\n"
          head << "content-type: #{status < 300 ? 'application/json' : 'text/plain'}\r\ncontent-length: #{data.bytesize}\r\n" unless status == 204
          client.write("#{head}\r\n#{data}")
        end
      rescue IOError, SystemCallError
        nil
      ensure
        client.close
      end

      # [headers, body] of the next request on a keep-alive connection, or
      # nil at its end.
      def self.read_request(client)
        line = client.gets("\r\n")
        return nil if line.nil? || line.strip.empty?

        headers = {}
        while (h = client.gets("\r\n")) && h != "\r\n"
          name, value = h.split(":", 2)
          headers[name.strip.downcase] = value.to_s.strip
        end
        return [headers, nil] unless headers.key?("content-length")

        length = headers["content-length"].to_i
        [headers, length.positive? ? client.read(length) : ""]
      end
    end
  end
end
