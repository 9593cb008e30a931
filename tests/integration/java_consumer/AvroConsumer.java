// Reads a topic the relay wrote with --message-format avro, as a JVM consumer does: kafka-clients
// with Apicurio Registry's AvroKafkaDeserializer for both key and value, configured for the
// Confluent wire format (magic byte 0, 4-byte schema id, Avro body; no Apicurio headers).
//
//   java -cp LIB/*:CLASSES AvroConsumer BOOTSTRAP REGISTRY_URL TOPIC COUNT TIMEOUT_SECONDS
//
// REGISTRY_URL is Apicurio's core API (http://host:port/apis/registry/v3). Prints one JSON
// line per record, {"key": ..., "value": ...}, the value as GenericRecord.toString() renders it;
// exits 0 after COUNT records, 1 if they do not arrive within TIMEOUT_SECONDS.
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.generic.GenericData;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;

public final class AvroConsumer {
    public static void main(String[] args) {
        if (args.length != 5) {
            System.err.println("usage: AvroConsumer BOOTSTRAP REGISTRY_URL TOPIC COUNT TIMEOUT_SECONDS");
            System.exit(2);
        }
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        int wanted = Integer.parseInt(args[3]);
        Instant deadline = Instant.now().plusSeconds(Long.parseLong(args[4]));

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "java-avro-consumer-" + UUID.randomUUID());
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, AvroKafkaDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, AvroKafkaDeserializer.class.getName());
        // Apicurio's serdes, set for the Confluent wire format the relay writes:
        props.put("apicurio.registry.url", args[1]);
        props.put("apicurio.registry.headers.enabled", "false");  // the schema id is in the body
        props.put("apicurio.registry.id-handler", "io.apicurio.registry.serde.Default4ByteIdHandler");
        props.put("apicurio.registry.use-id", "contentId");  // what the ccompat API calls the schema id

        int seen = 0;
        try (KafkaConsumer<Object, Object> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[2]));
            while (seen < wanted) {
                Duration left = Duration.between(Instant.now(), deadline);
                if (left.isNegative()) {
                    System.err.println("AvroConsumer: " + seen + " of " + wanted + " records within "
                                       + args[4] + " s");
                    System.exit(1);
                }
                for (ConsumerRecord<Object, Object> record : consumer.poll(left)) {
                    out.println("{\"key\": " + GenericData.get().toString(record.key())
                                + ", \"value\": " + record.value() + "}");
                    seen++;
                }
            }
        }
    }
}
